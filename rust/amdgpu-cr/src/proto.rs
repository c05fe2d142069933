//! Generated protobuf messages of `proto/criu-amdgpu.proto`.
//!
//! Fields upstream marks `required` are plain fields, so prost always emits
//! them (protobuf-c, upstream's decoder, rejects messages that lack one).

#![allow(missing_docs)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/criu_amdgpu.rs"));
