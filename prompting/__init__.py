"""The prompting library, shared by the frontend and the router: chat template rendering, chat messages
made into the template's input, template arguments, prompt truncation, and a checkpoint's tokenizer and
model files. Pure: no sockets, no event loop, no threads; it never imports a service."""
