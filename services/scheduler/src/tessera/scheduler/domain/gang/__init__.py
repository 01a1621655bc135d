"""Gangs: pod groups placed all-or-nothing, their queue, quorum, timeouts, backoff and requeue hints."""
