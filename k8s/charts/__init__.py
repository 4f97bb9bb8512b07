"""One module per chart."""
