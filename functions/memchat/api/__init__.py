"""The HTTP edge: FastAPI app, routes per resource, auth and errors."""
