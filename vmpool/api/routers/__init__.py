"""One router per resource: on-demand requests, tokens, status, health and metrics."""
