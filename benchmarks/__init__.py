"""The harness's own measured runs (a package so module names never clash with tests/)."""
