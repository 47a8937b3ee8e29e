"""HTTP in: the Flask app of one service (``create_app``), gunicorn, the dead-letter sink."""
