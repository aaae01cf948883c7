// Linux test harness: a host-memory stand-in for the part of Apple's IOSurface C API that
// csrc/ane_client.mm uses. Same names and signatures as <IOSurface/IOSurface.h>; CF types are
// opaque pointers (a CFDictionaryRef here is an NSDictionary, as toll-free bridging makes it on
// Apple). IOSurfaceCreate checks the properties docs/hardware.md §3 documents for ANE I/O surfaces.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef const void* CFTypeRef;
typedef const struct __CFString* CFStringRef;
typedef const struct __CFDictionary* CFDictionaryRef;
typedef struct __IOSurface* IOSurfaceRef;
typedef uint32_t IOSurfaceLockOptions;
typedef int kern_return_t;
enum { kIOSurfaceLockReadOnly = 0x00000001, kIOSurfaceLockAvoidSync = 0x00000002 };

extern const CFStringRef kIOSurfaceWidth;
extern const CFStringRef kIOSurfaceHeight;
extern const CFStringRef kIOSurfaceBytesPerElement;
extern const CFStringRef kIOSurfaceBytesPerRow;
extern const CFStringRef kIOSurfaceAllocSize;
extern const CFStringRef kIOSurfacePixelFormat;

IOSurfaceRef IOSurfaceCreate(CFDictionaryRef properties);
kern_return_t IOSurfaceLock(IOSurfaceRef buffer, IOSurfaceLockOptions options, uint32_t* seed);
kern_return_t IOSurfaceUnlock(IOSurfaceRef buffer, IOSurfaceLockOptions options, uint32_t* seed);
void* IOSurfaceGetBaseAddress(IOSurfaceRef buffer);
size_t IOSurfaceGetAllocSize(IOSurfaceRef buffer);
CFTypeRef CFRetain(CFTypeRef cf);
void CFRelease(CFTypeRef cf);

// Stand-in only: how many CPU locks are held on the surface (the framework stand-in refuses to
// evaluate on a locked surface).
int OrionStandInIOSurfaceLockCount(IOSurfaceRef buffer);

#ifdef __cplusplus
}
#endif
