"""MIG and time-slicing layouts."""
