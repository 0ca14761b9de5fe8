"""``nearline serve``: the command line of :mod:`nearline.server`."""

from __future__ import annotations

import argparse
from typing import Any

from .cli_types import _budget, _positive_float, _positive_int


def register(sub: Any) -> None:
    """Adds ``serve`` to the ``nearline`` command's subparsers."""
    from .server import Limits, TOKENS_ENV

    d = Limits()
    p = sub.add_parser("serve", help="serve indexes over HTTP/JSON (search, updates, metrics; see docs/serving.md)")
    p.add_argument("indexes", nargs="+", metavar="INDEX",
                   help="index directory to serve, as NAME=PATH or PATH (the collection is then named after the directory)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; without tokens only a loopback "
                        "address is accepted)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0 picks a free one)")
    p.add_argument("--token-file", default=None,
                   help=f"bearer tokens, one 'read:TOKEN' or 'write:TOKEN' per line, readable by its owner only "
                        f"(also read from ${TOKENS_ENV}); a read token searches, a write token also updates "
                        "(default: none; then only a loopback address may be served)")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="serve a non-loopback address without tokens (anyone who reaches the port may write)")
    p.add_argument("--max-body", type=_positive_int, default=d.max_body, help="largest request body in bytes")
    p.add_argument("--max-batch", type=_positive_int, default=d.max_batch,
                   help="most queries or vectors in one request")
    p.add_argument("--deadline", type=_positive_float, default=d.deadline,
                   help="seconds a search request may run before it is answered 504 (a request's 'timeout' may "
                        "only shorten it)")
    p.add_argument("--max-concurrent", type=_positive_int, default=d.max_concurrent,
                   help="requests answered at once (others wait up to the deadline, then get 503)")
    p.add_argument("--io-threads", type=_positive_int, default=2,
                   help="threads of the HTTP front end that read requests and write replies (searches run "
                        "on their own threads)")
    p.add_argument("--grace", type=_positive_float, default=d.grace,
                   help="seconds SIGTERM waits for requests in flight before the indexes close")
    p.add_argument("--memory-budget", type=_budget, default=None,
                   help="memory budget of each index opened (default: each index's own)")
    p.add_argument("--threads", type=_positive_int, default=None, help="search threads of each index (default: each index's own)")
    p.add_argument("--read-only", action="store_true", help="open the indexes read-only (writes get 400)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import Limits, serve

    limits = Limits(max_body=args.max_body, max_batch=args.max_batch, deadline=args.deadline,
                    max_concurrent=args.max_concurrent, grace=args.grace)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} must be in 0..65535")
    return serve(args.indexes, host=args.host, port=args.port, token_file=args.token_file, limits=limits,
                 allow_no_auth=args.insecure_no_auth, io_threads=args.io_threads, memory_budget=args.memory_budget, threads=args.threads,
                 read_only=True if args.read_only else None)
