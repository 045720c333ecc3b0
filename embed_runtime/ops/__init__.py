"""Operations, beside the request path.

The stub watch and health probe of ``model_manager``, the busy board shared by encoder
instances, the weight cache and its external data, and model-file integrity digests.
"""
