//! kfd-client
