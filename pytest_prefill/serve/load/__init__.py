"""Load against a server: ``loadgen`` (a workload replayed against a URL), ``records`` (what a
run measured, and the engines' counter names) and ``server_metrics`` (a run with the server's
own counters); ``mooncake``."""
