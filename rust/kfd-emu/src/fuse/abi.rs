//! The FUSE wire structs this transport uses (protocol 7.40+).
//!
//! Written here because the distribution's `linux/fuse.h` stops at 7.38
//! and lacks `backing_id`, `max_stack_depth` and the backing ioctls.  All
//! structs are plain little-endian C layouts; sizes are asserted below.

pub const FUSE_KERNEL_VERSION: u32 = 7;
/// 7.40 introduced passthrough; nothing newer is needed.
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 40;
pub const FUSE_ROOT_ID: u64 = 1;

pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const OPEN: u32 = 14;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const FORGET: u32 = 2;
    pub const BATCH_FORGET: u32 = 42;
}

// fuse_init_in/out flags (the upper 32 bits travel in flags2).
pub const FUSE_ASYNC_READ: u64 = 1 << 0;
pub const FUSE_BIG_WRITES: u64 = 1 << 5;
pub const FUSE_MAX_PAGES: u64 = 1 << 22;
pub const FUSE_INIT_EXT: u64 = 1 << 30;
pub const FUSE_DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
pub const FUSE_PASSTHROUGH: u64 = 1 << 37;

pub const FOPEN_NOFLUSH: u32 = 1 << 5;
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;

/// Set in an INTERRUPT request's own `unique`.
pub const FUSE_INT_REQ_BIT: u64 = 1;

pub const FUSE_IOCTL_COMPAT: u32 = 1 << 0;
pub const FUSE_IOCTL_UNRESTRICTED: u32 = 1 << 1;

/// `_IOW(229, 1, struct fuse_backing_map)`.
pub const FUSE_DEV_IOC_BACKING_OPEN: u64 = 0x4010_e501;
/// `_IOW(229, 2, uint32_t)`.
pub const FUSE_DEV_IOC_BACKING_CLOSE: u64 = 0x4004_e502;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OutHeader {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
    pub unused: [u32; 11],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub request_timeout: u16,
    pub unused: [u16; 11],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenIn {
    pub flags: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ReleaseIn {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

/// `fuse_entry_out`: the answer to LOOKUP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

/// `fuse_forget_in` (FORGET's body; BATCH_FORGET's entries carry the node
/// id first: [`ForgetOne`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ForgetIn {
    pub nlookup: u64,
}

/// `fuse_batch_forget_in`, followed by `count` [`ForgetOne`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchForgetIn {
    pub count: u32,
    pub dummy: u32,
}

/// `fuse_forget_one`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ForgetOne {
    pub nodeid: u64,
    pub nlookup: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

impl StatfsOut {
    /// What the emulator's file systems answer to statfs: no blocks or
    /// inodes to count, 4 KiB blocks, 255-byte names.
    pub fn empty() -> Self {
        StatfsOut {
            bsize: 4096,
            frsize: 4096,
            namelen: 255,
            ..Default::default()
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InterruptIn {
    pub unique: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoctlIn {
    pub fh: u64,
    pub flags: u32,
    pub cmd: u32,
    pub arg: u64,
    pub in_size: u32,
    pub out_size: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoctlOut {
    pub result: i32,
    pub flags: u32,
    pub in_iovs: u32,
    pub out_iovs: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BackingMap {
    pub fd: i32,
    pub flags: u32,
    pub padding: u64,
}

const _: () = {
    assert!(size_of::<InHeader>() == 40);
    assert!(size_of::<OutHeader>() == 16);
    assert!(size_of::<InitIn>() == 64);
    assert!(size_of::<InitOut>() == 64);
    assert!(size_of::<OpenIn>() == 8);
    assert!(size_of::<OpenOut>() == 16);
    assert!(size_of::<ReleaseIn>() == 24);
    assert!(size_of::<Attr>() == 88);
    assert!(size_of::<AttrOut>() == 104);
    assert!(size_of::<StatfsOut>() == 80);
    assert!(size_of::<EntryOut>() == 128);
    assert!(size_of::<ForgetIn>() == 8);
    assert!(size_of::<BatchForgetIn>() == 8);
    assert!(size_of::<ForgetOne>() == 16);
    assert!(size_of::<IoctlIn>() == 32);
    assert!(size_of::<IoctlOut>() == 16);
    assert!(size_of::<BackingMap>() == 16);
};

/// Marker for the plain-old-data wire structs above.
///
/// # Safety
/// Implementors must be `repr(C)`, contain only integer fields and arrays
/// of them, and have no padding, so every byte pattern is a valid value
/// and every value's bytes are initialised.
pub unsafe trait Pod: Copy + Default {}

macro_rules! pod {
    ($($t:ty),*) => { $(
        // SAFETY: repr(C) structs of integers whose sizes are asserted above
        // to equal the sum of their fields (no padding).
        unsafe impl Pod for $t {}
    )* };
}
pod!(
    InHeader,
    OutHeader,
    InitIn,
    InitOut,
    OpenIn,
    OpenOut,
    ReleaseIn,
    AttrOut,
    StatfsOut,
    EntryOut,
    ForgetIn,
    BatchForgetIn,
    ForgetOne,
    InterruptIn,
    IoctlIn,
    IoctlOut,
    BackingMap
);

/// Reads a `T` from the start of `buf`, or `None` if `buf` is too short.
pub fn read<T: Pod>(buf: &[u8]) -> Option<T> {
    if buf.len() < size_of::<T>() {
        return None;
    }
    let mut v = T::default();
    // SAFETY: `T: Pod` accepts any byte pattern; `buf` holds at least
    // `size_of::<T>()` bytes and `v` is a distinct, writable `T`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            buf.as_ptr(),
            (&mut v as *mut T).cast::<u8>(),
            size_of::<T>(),
        )
    };
    Some(v)
}

/// The bytes of a `T`.
pub fn bytes<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: `T: Pod` has no padding, so all `size_of::<T>()` bytes behind
    // the reference are initialised, and they live as long as `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}
