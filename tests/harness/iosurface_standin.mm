// Linux test harness: host-memory IOSurfaces (see include/IOSurface/IOSurface.h).
#import <Foundation/Foundation.h>
#include <IOSurface/IOSurface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct __IOSurface {
    uint64_t magic;
    std::atomic<int> refs;
    std::atomic<int> locks;
    size_t size;
    void* base;
};

namespace {
constexpr uint64_t kMagic = 0x10535552464143ULL;

bool is_surface(CFTypeRef cf) { return cf && static_cast<const __IOSurface*>(cf)->magic == kMagic; }

// Only reads the first 8 bytes: objects allocated by the ObjC runtime start with their isa pointer,
// which never equals kMagic.
long long number(NSDictionary* props, CFStringRef key, bool* ok) {
    id v = [props objectForKey:(id)key];
    if (![v isKindOfClass:[NSNumber class]]) {
        std::fprintf(stderr, "IOSurface stand-in: property %s missing or not a number\n", [(NSString*)key UTF8String]);
        *ok = false;
        return 0;
    }
    return [v longLongValue];
}
}  // namespace

extern "C" {

const CFStringRef kIOSurfaceWidth = (CFStringRef)@"IOSurfaceWidth";
const CFStringRef kIOSurfaceHeight = (CFStringRef)@"IOSurfaceHeight";
const CFStringRef kIOSurfaceBytesPerElement = (CFStringRef)@"IOSurfaceBytesPerElement";
const CFStringRef kIOSurfaceBytesPerRow = (CFStringRef)@"IOSurfaceBytesPerRow";
const CFStringRef kIOSurfaceAllocSize = (CFStringRef)@"IOSurfaceAllocSize";
const CFStringRef kIOSurfacePixelFormat = (CFStringRef)@"IOSurfacePixelFormat";

IOSurfaceRef IOSurfaceCreate(CFDictionaryRef properties) {
    NSDictionary* props = (NSDictionary*)properties;
    if (![props isKindOfClass:[NSDictionary class]]) return nullptr;
    bool ok = true;
    const long long width = number(props, kIOSurfaceWidth, &ok), height = number(props, kIOSurfaceHeight, &ok),
                    bpe = number(props, kIOSurfaceBytesPerElement, &ok), bpr = number(props, kIOSurfaceBytesPerRow, &ok),
                    alloc = number(props, kIOSurfaceAllocSize, &ok), format = number(props, kIOSurfacePixelFormat, &ok);
    if (!ok) return nullptr;
    if (width <= 0 || height != 1 || bpe != 1 || bpr != width || alloc != width || format != 0) {
        std::fprintf(stderr,
                     "IOSurface stand-in: an ANE I/O surface is a flat byte buffer (Width = BytesPerRow = AllocSize = "
                     "bytes, Height = 1, BytesPerElement = 1, PixelFormat = 0; docs/hardware.md §3), got %lld/%lld/%lld/%lld/%lld/%lld\n",
                     width, height, bpe, bpr, alloc, format);
        return nullptr;
    }
    auto* s = new __IOSurface{kMagic, {1}, {0}, static_cast<size_t>(alloc), nullptr};
    s->base = std::calloc(1, s->size);
    return s;
}

kern_return_t IOSurfaceLock(IOSurfaceRef buffer, IOSurfaceLockOptions, uint32_t* seed) {
    if (!is_surface(buffer)) return 1;
    buffer->locks++;
    if (seed) *seed = 0;
    return 0;
}

kern_return_t IOSurfaceUnlock(IOSurfaceRef buffer, IOSurfaceLockOptions, uint32_t* seed) {
    if (!is_surface(buffer) || buffer->locks <= 0) {
        std::fprintf(stderr, "IOSurface stand-in: unlock of a surface that is not locked\n");
        return 1;
    }
    buffer->locks--;
    if (seed) *seed = 0;
    return 0;
}

void* IOSurfaceGetBaseAddress(IOSurfaceRef buffer) { return is_surface(buffer) ? buffer->base : nullptr; }
size_t IOSurfaceGetAllocSize(IOSurfaceRef buffer) { return is_surface(buffer) ? buffer->size : 0; }
int OrionStandInIOSurfaceLockCount(IOSurfaceRef buffer) { return is_surface(buffer) ? buffer->locks.load() : -1; }

CFTypeRef CFRetain(CFTypeRef cf) {
    if (is_surface(cf))
        const_cast<__IOSurface*>(static_cast<const __IOSurface*>(cf))->refs++;
    else if (cf)
        [(id)cf retain];
    return cf;
}

void CFRelease(CFTypeRef cf) {
    if (is_surface(cf)) {
        auto* s = const_cast<__IOSurface*>(static_cast<const __IOSurface*>(cf));
        if (--s->refs == 0) {
            s->magic = 0;
            std::free(s->base);
            delete s;
        }
    } else if (cf) {
        [(id)cf release];
    }
}

}  // extern "C"
