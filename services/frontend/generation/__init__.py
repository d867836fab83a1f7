"""Generation (layer 4): the core both faces share (frontend_core.py: launch, the output parser's
choice, what the engines can give, the context length), submission to engines, output processing,
shutdown and metrics. Imports the layers below and the root's errors.py and config.py; never a face."""
