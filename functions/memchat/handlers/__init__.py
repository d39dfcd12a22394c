"""AWS Lambda entry points, one module per kind of function in template.yaml.

`instance.build_app()` builds the app once per instance (settings with the
secrets fetched, the FastAPI app); `http` adapts it to API Gateway with
mangum, and `chat` and `clear` expose that to functions sized for their
routes; `stream` serves what must stream from a function URL, behind the
Lambda Web Adapter (the exports, and POST /chat's Server-Sent Events);
`cleanup` runs the scheduled TTL cleanup and `summarize` the rolling
summaries. Each function's ROUTE_GROUPS (template.yaml) narrows the settings
and the routes to what it serves, so only the chat functions (and the
summary worker) read the model key.
"""
