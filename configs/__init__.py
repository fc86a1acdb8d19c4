"""ml_collections recipes shipped with jaxtl (``--config=configs/NAME.py``)."""
