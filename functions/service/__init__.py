"""The service logic: validate a request, answer from stored results or the cache, otherwise
run the resource once (``Service``), however often the request is delivered."""
