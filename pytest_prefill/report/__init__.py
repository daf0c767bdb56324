"""Tables, timelines, verdicts and comparisons a person reads. Lower layers return data; this layer renders it."""
