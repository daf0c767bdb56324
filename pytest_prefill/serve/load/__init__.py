"""Load against a server: ``loadgen`` (a workload replayed against a URL), ``records`` (what a
run measured) and ``server_metrics`` (a run with the server's own counters); ``mooncake``."""
