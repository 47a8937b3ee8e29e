"""The Kubernetes runtime: each task as a Job (``kubernetes``), planned as data (``job_plan``,
``podspec``), created with its stdin Secret (``job_launch``), followed by one pod watch per
replica (``pod_watch``) and judged from its pods (``job_status``)."""
