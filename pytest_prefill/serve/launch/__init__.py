"""Running engines on this host: ``process`` (start and stop, and pinning), ``launchers``
(restarted under a flag set), ``transformers_capped``, ``model_folder``, ``reference``."""
