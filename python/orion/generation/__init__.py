"""Model-independent text generation: the decode plan, the KV cache, the generation loop, sampling,
the tokenizer, chat templates, ``generation_config.json`` defaults and streaming text (incremental
detokenization, stop strings). A model (``orion.models.*``) supplies its graphs and weights through
the hooks of :class:`orion.generation.loop.CausalLM`."""
