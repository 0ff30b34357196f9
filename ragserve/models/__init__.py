"""Generation engines behind one interface (``base.GenerationEngine``): the embedded transformers
engine (CPU default), vLLM (GPU) and a remote OpenAI-compatible server. ``factory.make_engine``
picks one from the settings; the engine modules themselves are imported only when used, and this
package imports nothing, so ``ragserve.api.sampling`` stays a leaf that the API models can use."""
