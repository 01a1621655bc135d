"""The database: async engine, unit of work, messaging tables and migrations."""
