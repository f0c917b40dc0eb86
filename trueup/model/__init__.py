"""Pure data: the desired-state document, reason codes, health. No I/O besides reading a file."""
