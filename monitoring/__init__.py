"""`mlops monitor`: the requests a model version answered, read from its request logs, against the data it was trained
on (skew) and against the requests before them (drift), with TFDV's statistics and comparators."""
