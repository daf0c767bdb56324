"""The hardware suite, shipped with the package so it runs in any project where pytest-prefill is
installed: ``pytest --pyargs pytest_prefill.suite -m gpu`` calibrates the device under test, runs
the falsifier and the fidelity check, and reports each in the terminal summary
(``--prefill-device cpu --prefill-model tiny --prefill-dry-run`` rehearses it on a CPU in
minutes). Its tests use the plugin's fixtures as a user's own gpu tests would."""
