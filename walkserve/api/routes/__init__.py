"""FastAPI routers: thin functions that check, plan, then stream or collect."""
