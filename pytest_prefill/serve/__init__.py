"""Running servers of other engines reached over HTTP, one concept a folder.

Reading order: ``client`` (the streaming HTTP client, what each engine is sent, prompts of exact
token lengths, which server a URL is, its counters' names), ``load`` (replaying a workload
against a URL, what a run measured, a run with the server's own counters), ``launch`` (starting
and stopping a local server, the launchers a verification restarts, pinning, a servable model
folder, the reference server with known token times, what a server runs with), ``calibration``
(what the calibration sends, the difference method over HTTP, a measured run replayed in the
simulator) and ``fidelity`` (held-out workloads measured and simulated, and how sure the verdict
is). Checking a capacity answer on a server sits one layer up, in ``pytest_prefill.verify``."""
