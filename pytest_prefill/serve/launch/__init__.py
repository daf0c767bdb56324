"""Running engines on this host: ``process`` (start and stop), ``launchers`` (restarted under a
flag set), ``pinning``, ``transformers_capped``, ``model_folder``, ``reference``, ``server_facts``."""
