"""`replayjax serve`: an OpenAI-compatible HTTP server for many concurrent clients.

Modules: `cli` (the command: flags, engine, uvicorn, drain on SIGTERM), `app` (the Starlette app:
endpoints, admission, errors), `protocol` (request checks and OpenAI's response shapes),
`generation` (one request in flight: events -> text), `worker` (the engine thread), `text`
(incremental detokenization, stop strings), `chat` (chat templates), `model_files` (tokenizer,
eos ids and sampling defaults of a model dir), `metrics` (Prometheus).
"""
