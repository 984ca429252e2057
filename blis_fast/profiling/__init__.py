"""GPU profiles for the ``profiled`` latency backend: fitting them to measured steps
(``calibrate``) and the accuracy table of every backend against measured steps (``accuracy``)."""
