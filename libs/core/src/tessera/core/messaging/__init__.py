"""Messaging over NATS JetStream: CloudEvents envelope, streams, consumers, outbox relay, dead letters."""
