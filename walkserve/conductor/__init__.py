"""The conductor: admission, walk transitions through the model's state machine, results, aborts, failures."""
