"""The published language: versioned commands and events, the job spec, and subject names."""
