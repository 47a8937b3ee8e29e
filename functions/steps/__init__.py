"""What runs around a resource script, in every runtime: the task pod's contract, the stage and collect steps, the time budget, and the outcome of a script."""
