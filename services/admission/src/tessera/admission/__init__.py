"""Multi-tenant queues, quotas and admission."""
