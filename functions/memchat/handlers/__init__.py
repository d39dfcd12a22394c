"""AWS Lambda entry points, one module per function in template.yaml.

`http` builds the app once per instance (settings with secrets fetched, the
FastAPI app, the mangum adapter); `chat`, `clear` and `export` expose it to
functions sized for their routes; `cleanup` runs the scheduled TTL cleanup.
"""
