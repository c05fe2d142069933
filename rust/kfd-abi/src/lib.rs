//! kfd-abi
