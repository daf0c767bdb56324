"""Running servers of other engines reached over HTTP: the load generator, calibration from a
server, and fidelity against it; and a random-weight model folder such a server can serve.

Reading order: ``http`` (the streaming client), ``api`` (what each engine is sent, how its
chunks are counted), ``prompts`` (exact token lengths), ``identity`` (which server a URL is),
``loadgen`` (replaying a workload against a URL), ``records`` (what a run measured, and its
serving metrics), ``reference`` (a server with known token times: the client's own error),
``process`` (starting and stopping a local server), ``model_folder`` (a servable model, made
offline); then ``experiments`` (what the calibration sends, and what token times say about
the iterations behind them), ``calibration_fit`` and ``calibration`` (the difference method
over HTTP), ``simulated`` (a measured run replayed in the simulator) and ``fidelity``."""
