"""AWS Lambda entry points, one module per function in template.yaml.

`instance.build_app()` builds the app once per instance (settings with the
secrets fetched, the FastAPI app); `http` adapts it to API Gateway with
mangum, and `chat` and `clear` expose that to functions sized for their
routes; `stream` serves the exports from a function URL; `cleanup` runs the
scheduled TTL cleanup. Each function's ROUTE_GROUPS (template.yaml) narrows
the settings and the routes to what it serves, so only the chat function
reads the model key.
"""
