"""Running a sweep on Ray: the driver, its scheduler, worker-group replicas and training jobs."""
