"""The published language: versioned commands, events and subjects."""
