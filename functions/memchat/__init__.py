"""memchat: a serverless chat backend with persistent memory."""

__version__ = "0.1.0"
