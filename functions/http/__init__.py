"""HTTP in: the Flask app of one service (``create_app``), the short way for repeated gets in
front of it, gunicorn, the dead-letter sink."""
