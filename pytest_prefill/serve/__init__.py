"""Running servers of other engines reached over HTTP, one concept a folder.

Reading order: ``client`` (the streaming HTTP client, what each engine is sent, prompts of exact
token lengths, which server a URL is and what it runs with), ``load`` (replaying a workload
against a URL, what a run measured and the engines' counter names, a run with the server's own
counters), ``launch`` (starting and stopping a local server, pinning it, the launchers a
verification restarts, a servable model folder, the reference server with known token times),
``calibration`` (what the calibration sends, the difference method over HTTP, a measured run
replayed in the simulator) and ``fidelity`` (held-out workloads measured and simulated, and how
sure the verdict is). Checking a capacity answer on a server sits one layer up, in
``pytest_prefill.verify``."""
