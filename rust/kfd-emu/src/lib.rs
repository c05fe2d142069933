//! kfd-emu
