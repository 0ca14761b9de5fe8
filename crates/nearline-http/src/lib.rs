//! `nearline serve`'s HTTP front end, in Rust: connections (hyper on
//! tokio), routing, bearer-token scopes, request limits and a draining
//! shutdown ([`server`]); the search endpoints answered without Python
//! ([`search`]), their options read by the engine's own option reader
//! ([`options`]); the wire format of arrays and errors ([`wire`]). The
//! Python server (`python/nearline/server.py`) starts it through the
//! bindings and answers the other endpoints as its [`server::Delegate`].

pub mod options;
pub mod search;
pub mod server;
pub mod wire;

pub use server::{Config, Delegate, Event, Limits, Reply, Server, Tokens};
