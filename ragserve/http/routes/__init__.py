"""The HTTP surfaces, one router each: the OpenAI-compatible API, the document API, the probes.

Handlers translate HTTP to service calls and back, nothing more: the logic is in ``ragserve.service``."""
