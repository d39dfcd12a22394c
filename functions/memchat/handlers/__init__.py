"""AWS Lambda entry points, one module per kind of function in template.yaml.

Each adapts its event and calls what memchat.bootstrap built: `http` serves
the app through API Gateway with mangum (`chat` and `clear` expose it to
functions sized for their routes), `stream` serves what must stream from a
function URL behind the Lambda Web Adapter, `cleanup` and `summarize` run
the scheduled jobs. Each function's ROUTE_GROUPS (template.yaml), or its
job, narrows the settings and the routes to what it serves, so only the
chat functions and the summary worker read the model key.
"""
