// Linux test harness: a behavioural stand-in for Apple's private AppleNeuralEngine.framework.
// It defines the four classes csrc/ane_client.mm looks up, with exactly the selectors and argument
// types of docs/hardware.md §2, refuses what the real framework is known to refuse or crash on (each
// refusal is printed to stderr as "AppleNeuralEngine stand-in: ANE-xx ..." and counted), and
// executes programs through the emulator core (standin_exec.cpp). Built only with
// -DORION_ANE_HARNESS=ON; loaded by the client through ORION_ANE_FRAMEWORK.
//
// It also refuses MIL without a buildInfo block (every program that ran on hardware has one; Orion
// adds the default block in orion.compile), so every harness suite checks none reaches the framework
// without it; it answers compiledModelExists from its model directory; and a test hook makes the
// next call of a chosen selector raise an NSException, as the real framework may.
//
// Modelled behaviour: compile writes the compiled program (net.plist) and the baked weights (data)
// into the model directory; load reads both, so weights changed on disk after compile are ignored
// (docs/hardware.md §6) and the patch path (donor net.plist + new data, load without compile) works.
#import <Foundation/Foundation.h>
#include <IOSurface/IOSurface.h>

#include <cstdio>
#include <map>
#include <set>
#include <mutex>
#include <string>
#include <vector>

#include "standin_exec.h"

namespace {

struct Stats {
    int descriptors = 0, compiles = 0, loads = 0, evaluates = 0, requests = 0, request_reuses = 0, unloads = 0,
        leaks = 0, violations = 0, fail_loads = 0, live_models = 0, compile_skips = 0, exceptions = 0;
    std::string throw_in;  // a selector name: its next call raises an NSException (orion_ane_standin_throw_next)
    std::set<std::string> compiled;  // hexStringIdentifiers compiled by this process (the modelled cache)
    unsigned last_qos = 0;
    bool qos_always_21 = true;
    std::string last_violation;
};
Stats g;
std::mutex g_mutex;

void record_qos(unsigned value) {
    g.last_qos = value;
    if (value != 21) g.qos_always_21 = false;
}

NSString* violation(NSString* message) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g.violations++;
    g.last_violation = [message UTF8String];
    std::fprintf(stderr, "AppleNeuralEngine stand-in: %s\n", [message UTF8String]);
    return message;
}

void fail(NSError** error, NSString* message, NSInteger code) {
    if (error)
        *error = [NSError errorWithDomain:@"com.apple.appleneuralengine"
                                     code:code
                                 userInfo:[NSDictionary dictionaryWithObject:message forKey:NSLocalizedDescriptionKey]];
}

// The hook of orion_ane_standin_throw_next: raises when `selector` is the armed one (once).
void maybe_raise(const char* selector) {
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        if (g.throw_in != selector) return;
        g.throw_in.clear();
        g.exceptions++;
    }
    [NSException raise:@"ANEStandInException" format:@"stand-in exception in %s", selector];
}

std::string bytes(NSData* d) { return std::string(static_cast<const char*>([d bytes]), [d length]); }

uint64_t fnv(uint64_t h, const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
    return h;
}

NSString* read_file(NSString* path, std::string* out) {
    NSData* d = [NSData dataWithContentsOfFile:path];
    if (!d) return path;
    *out = bytes(d);
    return nil;
}

}  // namespace

@interface _ANEInMemoryModelDescriptor : NSObject {
@public
    NSData* mil_;
    NSDictionary* weights_;
}
+ (id)modelWithMILText:(NSData*)text weights:(NSDictionary*)weights optionsPlist:(NSDictionary*)options;
@end

@implementation _ANEInMemoryModelDescriptor
+ (id)modelWithMILText:(NSData*)text weights:(NSDictionary*)weights optionsPlist:(NSDictionary*)options {
    maybe_raise("modelWithMILText:weights:optionsPlist:");
    id textObject = text, weightsObject = weights;
    if (![textObject isKindOfClass:[NSData class]]) {
        violation([NSString stringWithFormat:@"ANE-17: modelWithMILText: needs the MIL as NSData (UTF-8 bytes), got %@ "
                                             @"(the real framework crashes on an NSString)",
                                             textObject ? NSStringFromClass([textObject class]) : @"nil"]);
        return nil;
    }
    if (![weightsObject isKindOfClass:[NSDictionary class]]) {
        violation(@"ANE-18: weights: must be a dictionary, @{} when the program has no weights (nil crashes or fails "
                  @"on the real framework)");
        return nil;
    }
    for (id key in weights) {
        id entry = [weights objectForKey:key];
        if (![key isKindOfClass:[NSString class]] || ![key hasPrefix:@"@model_path/"] ||
            ![entry isKindOfClass:[NSDictionary class]] ||
            ![[entry objectForKey:@"data"] isKindOfClass:[NSData class]] ||
            ![[entry objectForKey:@"offset"] isKindOfClass:[NSNumber class]]) {
            violation([NSString stringWithFormat:@"ANE-34: weight entry %@ must be @\"@model_path/...\": "
                                                 @"@{@\"offset\": NSNumber, @\"data\": NSData}", key]);
            return nil;
        }
    }
    _ANEInMemoryModelDescriptor* d = [[[self alloc] init] autorelease];
    d->mil_ = [text copy];
    d->weights_ = [weights copy];
    std::lock_guard<std::mutex> lock(g_mutex);
    g.descriptors++;
    return d;
}
- (void)dealloc {
    [mil_ release];
    [weights_ release];
    [super dealloc];
}
@end

@interface _ANEIOSurfaceObject : NSObject {
@public
    IOSurfaceRef surface_;
}
+ (id)objectWithIOSurface:(IOSurfaceRef)surface;
@end

@implementation _ANEIOSurfaceObject
+ (id)objectWithIOSurface:(IOSurfaceRef)surface {
    if (!surface) return nil;
    _ANEIOSurfaceObject* o = [[[self alloc] init] autorelease];
    o->surface_ = surface;
    CFRetain(surface);
    return o;
}
- (void)dealloc {
    CFRelease(surface_);
    [super dealloc];
}
@end

@interface _ANERequest : NSObject {
@public
    NSArray* inputs_;
    NSArray* outputs_;
    int evaluations_;
}
+ (id)requestWithInputs:(NSArray*)inputs
           inputIndices:(NSArray*)inputIndices
                outputs:(NSArray*)outputs
          outputIndices:(NSArray*)outputIndices
          weightsBuffer:(id)weightsBuffer
              perfStats:(id)perfStats
         procedureIndex:(NSNumber*)procedureIndex;
@end

static bool valid_side(NSArray* surfaces, NSArray* indices) {
    if (![surfaces isKindOfClass:[NSArray class]] || ![indices isKindOfClass:[NSArray class]] ||
        [surfaces count] != [indices count])
        return false;
    for (NSUInteger i = 0; i < [surfaces count]; ++i) {
        id s = [surfaces objectAtIndex:i], n = [indices objectAtIndex:i];
        if (![s isKindOfClass:[_ANEIOSurfaceObject class]] || ![n isKindOfClass:[NSNumber class]] ||
            [n unsignedIntegerValue] != i)
            return false;
    }
    return true;
}

@implementation _ANERequest
+ (id)requestWithInputs:(NSArray*)inputs
           inputIndices:(NSArray*)inputIndices
                outputs:(NSArray*)outputs
          outputIndices:(NSArray*)outputIndices
          weightsBuffer:(id)weightsBuffer
              perfStats:(id)perfStats
         procedureIndex:(NSNumber*)procedureIndex {
    maybe_raise("requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:");
    if (!valid_side(inputs, inputIndices) || !valid_side(outputs, outputIndices)) {
        violation(@"requestWithInputs: needs NSArrays of _ANEIOSurfaceObject with NSNumber indices 0..n-1");
        return nil;
    }
    id index = procedureIndex;
    if (![index isKindOfClass:[NSNumber class]]) {
        violation(@"requestWithInputs: procedureIndex must be an NSNumber (@0)");
        return nil;
    }
    _ANERequest* r = [[[self alloc] init] autorelease];
    r->inputs_ = [inputs copy];
    r->outputs_ = [outputs copy];
    std::lock_guard<std::mutex> lock(g_mutex);
    g.requests++;
    return r;
}
- (void)dealloc {
    [inputs_ release];
    [outputs_ release];
    [super dealloc];
}
@end

@interface _ANEInMemoryModel : NSObject {
    _ANEInMemoryModelDescriptor* descriptor_;
    standin::Program* program_;
    BOOL loaded_;
}
+ (id)inMemoryModelWithDescriptor:(id)descriptor;
- (NSString*)hexStringIdentifier;
- (BOOL)compileWithQoS:(unsigned int)qos options:(NSDictionary*)options error:(NSError**)error;
- (BOOL)loadWithQoS:(unsigned int)qos options:(NSDictionary*)options error:(NSError**)error;
- (BOOL)evaluateWithQoS:(unsigned int)qos options:(NSDictionary*)options request:(id)request error:(NSError**)error;
- (BOOL)unloadWithQoS:(unsigned int)qos error:(NSError**)error;
- (BOOL)compiledModelExists;
@end

@implementation _ANEInMemoryModel
+ (id)inMemoryModelWithDescriptor:(id)descriptor {
    if (![descriptor isKindOfClass:[_ANEInMemoryModelDescriptor class]]) return nil;
    _ANEInMemoryModel* m = [[[self alloc] init] autorelease];
    m->descriptor_ = [descriptor retain];
    std::lock_guard<std::mutex> lock(g_mutex);
    g.live_models++;
    return m;
}

- (void)dealloc {
    if (loaded_) {
        violation(@"ANE-33: a model was released while loaded: call unloadWithQoS:error: first (the real ANE leaks it)");
        std::lock_guard<std::mutex> lock(g_mutex);
        g.leaks++;
    }
    standin::destroy(program_);
    [descriptor_ release];
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        g.live_models--;
    }
    [super dealloc];
}

- (NSArray*)sortedKeys {
    return [[descriptor_->weights_ allKeys] sortedArrayUsingSelector:@selector(compare:)];
}

- (NSString*)hexStringIdentifier {
    uint64_t h = fnv(1469598103934665603ULL, bytes(descriptor_->mil_));
    for (NSString* key in [self sortedKeys]) {
        h = fnv(h, [key UTF8String]);
        h = fnv(h, bytes([[descriptor_->weights_ objectForKey:key] objectForKey:@"data"]));
    }
    return [NSString stringWithFormat:@"%016llX", (unsigned long long)h];
}

- (NSString*)directory {
    return [NSTemporaryDirectory() stringByAppendingPathComponent:[self hexStringIdentifier]];
}

- (NSString*)milHash {
    return [NSString stringWithFormat:@"%016llx", (unsigned long long)fnv(1469598103934665603ULL, bytes(descriptor_->mil_))];
}

// Whether this model's directory holds a program compiled from its MIL, with its weights (what the
// real framework's cache would hold; only models this process compiled, so tests do not depend on
// directories earlier runs left behind): the client then loads without compiling.
- (BOOL)compiledModelExists {
    maybe_raise("compiledModelExists");
    {
        std::lock_guard<std::mutex> lock(g_mutex);  // a directory left by another process does not count
        if (!g.compiled.count([[self hexStringIdentifier] UTF8String])) return NO;
    }
    NSString* dir = [self directory];
    std::string plist, data, expected;
    if (read_file([dir stringByAppendingPathComponent:@"net.plist"], &plist) ||
        plist.find([[self milHash] UTF8String]) == std::string::npos ||
        read_file([dir stringByAppendingPathComponent:@"data"], &data))
        return NO;
    for (NSString* key in [self sortedKeys]) expected += bytes([[descriptor_->weights_ objectForKey:key] objectForKey:@"data"]);
    if (data != expected) return NO;
    std::lock_guard<std::mutex> lock(g_mutex);
    g.compile_skips++;  // the client loads without compiling
    return YES;
}

- (BOOL)compileWithQoS:(unsigned int)qos options:(NSDictionary*)options error:(NSError**)error {
    maybe_raise("compileWithQoS:options:error:");
    record_qos(qos);
    NSString* dir = [self directory];
    BOOL isDir = NO;
    if (![[NSFileManager defaultManager] fileExistsAtPath:dir isDirectory:&isDir] || !isDir) {
        fail(error, violation([NSString stringWithFormat:@"ANE-19: the model directory %@ does not exist: create "
                                                         @"NSTemporaryDirectory()/<hexStringIdentifier> with model.mil "
                                                         @"and the weight files before compileWithQoS: (the real "
                                                         @"framework crashes)", dir]), 19);
        return NO;
    }
    std::string mil;
    if (read_file([dir stringByAppendingPathComponent:@"model.mil"], &mil) || mil != bytes(descriptor_->mil_)) {
        fail(error, violation([NSString stringWithFormat:@"ANE-19: %@/model.mil is missing or differs from the MIL "
                                                         @"given to the descriptor", dir]), 19);
        return NO;
    }
    std::vector<std::pair<std::string, std::string>> weights;
    std::string data;
    for (NSString* key in [self sortedKeys]) {
        NSString* rel = [key substringFromIndex:[@"@model_path/" length]];
        std::string file;
        const std::string expected = bytes([[descriptor_->weights_ objectForKey:key] objectForKey:@"data"]);
        if (read_file([dir stringByAppendingPathComponent:rel], &file) || file != expected) {
            fail(error, violation([NSString stringWithFormat:@"ANE-19: weight file %@/%@ (for %@) is missing or "
                                                             @"differs from the dictionary's data: write every weight "
                                                             @"file before compileWithQoS:", dir, rel, key]), 19);
            return NO;
        }
        weights.emplace_back([key UTF8String], expected);
        data += expected;
    }
    if (mil.find("buildInfo") == std::string::npos) {
        fail(error, violation(@"ANECCompile() FAILED: the MIL has no buildInfo block (every program that ran on "
                              @"hardware has one; orion.compile adds the default block, docs/hardware.md §4)"), 3);
        return NO;
    }
    std::string message;
    standin::Program* program = standin::build(mil, weights, &message);
    if (!program) {
        fail(error, [NSString stringWithFormat:@"ANECCompile() FAILED: InvalidMILProgram: %s", message.c_str()], 3);
        return NO;
    }
    standin::destroy(program);
    NSString* plist = [NSString stringWithFormat:@"orion-ane-standin compiled mil=%@\n", [self milHash]];
    [[plist dataUsingEncoding:NSUTF8StringEncoding] writeToFile:[dir stringByAppendingPathComponent:@"net.plist"]
                                                     atomically:NO];
    [[NSData dataWithBytes:data.data() length:data.size()] writeToFile:[dir stringByAppendingPathComponent:@"data"]
                                                            atomically:NO];
    std::lock_guard<std::mutex> lock(g_mutex);
    g.compiles++;
    g.compiled.insert([[self hexStringIdentifier] UTF8String]);
    return YES;
}


- (BOOL)loadWithQoS:(unsigned int)qos options:(NSDictionary*)options error:(NSError**)error {
    maybe_raise("loadWithQoS:options:error:");
    record_qos(qos);
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        if (g.fail_loads > 0) {
            g.fail_loads--;
            fail(error, @"ANEProgramLoad() failed: transient failure injected by the stand-in", 1);
            return NO;
        }
    }
    if (loaded_) {
        fail(error, violation(@"loadWithQoS: on a model that is already loaded"), 2);
        return NO;
    }
    NSString* dir = [self directory];
    std::string plist, data;
    if (read_file([dir stringByAppendingPathComponent:@"net.plist"], &plist)) {
        fail(error, violation([NSString stringWithFormat:@"load before compile: %@ has no net.plist (call "
                                                         @"compileWithQoS: first, or copy a donor's net.plist for a "
                                                         @"weight patch, docs/hardware.md §6)", dir]), 2);
        return NO;
    }
    if (plist.find([[self milHash] UTF8String]) == std::string::npos) {
        fail(error, violation(@"net.plist was compiled from a different MIL: a weight patch needs a donor compiled "
                              @"from the same MIL text"), 2);
        return NO;
    }
    if (read_file([dir stringByAppendingPathComponent:@"data"], &data)) {
        fail(error, violation([NSString stringWithFormat:@"%@ has no data file (compiled weights; a weight patch "
                                                         @"writes the new ones there)", dir]), 2);
        return NO;
    }
    std::vector<std::pair<std::string, std::string>> weights;
    size_t at = 0;
    for (NSString* key in [self sortedKeys]) {
        const size_t n = [[[descriptor_->weights_ objectForKey:key] objectForKey:@"data"] length];
        if (at + n > data.size()) break;
        weights.emplace_back([key UTF8String], data.substr(at, n));
        at += n;
    }
    if (at != data.size() || weights.size() != [descriptor_->weights_ count]) {
        fail(error, violation(@"the data file does not hold the descriptor's weights (sizes differ)"), 2);
        return NO;
    }
    std::string message;
    program_ = standin::build(bytes(descriptor_->mil_), weights, &message);
    if (!program_) {
        fail(error, [NSString stringWithFormat:@"ANEProgramLoad() failed: %s", message.c_str()], 2);
        return NO;
    }
    loaded_ = YES;
    std::lock_guard<std::mutex> lock(g_mutex);
    g.loads++;
    return YES;
}

- (BOOL)evaluateWithQoS:(unsigned int)qos options:(NSDictionary*)options request:(id)request error:(NSError**)error {
    maybe_raise("evaluateWithQoS:options:request:error:");
    record_qos(qos);
    if (!loaded_) {
        fail(error, violation(@"evaluate before load: status=0x1d statusType=0x9: Program Inference error (call "
                              @"loadWithQoS: first)"), 0x1d);
        return NO;
    }
    if (![request isKindOfClass:[_ANERequest class]]) {
        fail(error, violation(@"evaluateWithQoS: needs an _ANERequest"), 0x1d);
        return NO;
    }
    _ANERequest* r = request;
    if (r->evaluations_++ > 0) {
        std::lock_guard<std::mutex> lock(g_mutex);
        g.request_reuses++;
    }
    if ([r->inputs_ count] != standin::input_count(program_) || [r->outputs_ count] != standin::output_count(program_)) {
        fail(error, violation(@"status=0x1d statusType=0x9: Program Inference error: the request binds a different "
                              @"number of surfaces than the program has inputs/outputs"), 0x1d);
        return NO;
    }
    std::vector<std::pair<uint8_t*, size_t>> sides[2];
    NSArray* arrays[2] = {r->inputs_, r->outputs_};
    const char* names[2] = {"input", "output"};
    for (int side = 0; side < 2; ++side)
        for (_ANEIOSurfaceObject* o in arrays[side]) {
            if (OrionStandInIOSurfaceLockCount(o->surface_) != 0) {
                fail(error, violation([NSString stringWithFormat:@"an %s surface is locked during evaluate: unlock "
                                                                 @"surfaces before evaluateWithQoS: (docs/hardware.md §3)",
                                                                 names[side]]), 0x1d);
                return NO;
            }
            const size_t size = IOSurfaceGetAllocSize(o->surface_);
            if (!sides[side].empty() && size != sides[side].front().second) {
                fail(error, violation([NSString stringWithFormat:@"ANE-13: status=0x1d statusType=0x9: Program "
                                                                 @"Inference error: %s surfaces of %zu and %zu bytes "
                                                                 @"(all %ss of a program must have one size)",
                                                                 names[side], sides[side].front().second, size, names[side]]), 0x1d);
                return NO;
            }
            sides[side].emplace_back(static_cast<uint8_t*>(IOSurfaceGetBaseAddress(o->surface_)), size);
        }
    const std::string message = standin::evaluate(program_, sides[0], sides[1]);
    if (!message.empty()) {
        fail(error, [NSString stringWithFormat:@"status=0x1d statusType=0x9: Program Inference error: %s", message.c_str()], 0x1d);
        return NO;
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    g.evaluates++;
    return YES;
}

- (BOOL)unloadWithQoS:(unsigned int)qos error:(NSError**)error {
    maybe_raise("unloadWithQoS:error:");
    record_qos(qos);
    if (!loaded_) {
        fail(error, @"unloadWithQoS: the model is not loaded", 4);
        return NO;
    }
    standin::destroy(program_);
    program_ = nullptr;
    loaded_ = NO;
    std::lock_guard<std::mutex> lock(g_mutex);
    g.unloads++;
    return YES;
}
@end

// Test hooks, reached with ctypes from tests/harness/test_harness.py.
extern "C" {

const char* orion_ane_standin_stats(void) {
    static std::string out;
    std::lock_guard<std::mutex> lock(g_mutex);
    std::string v;
    for (char c : g.last_violation) v += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    out = "{\"descriptors\": " + std::to_string(g.descriptors) + ", \"compiles\": " + std::to_string(g.compiles) +
          ", \"loads\": " + std::to_string(g.loads) + ", \"evaluates\": " + std::to_string(g.evaluates) +
          ", \"requests\": " + std::to_string(g.requests) + ", \"request_reuses\": " + std::to_string(g.request_reuses) +
          ", \"unloads\": " + std::to_string(g.unloads) + ", \"leaks\": " + std::to_string(g.leaks) +
          ", \"live_models\": " + std::to_string(g.live_models) + ", \"violations\": " + std::to_string(g.violations) +
          ", \"compile_skips\": " + std::to_string(g.compile_skips) + ", \"exceptions\": " + std::to_string(g.exceptions) +
          ", \"qos_always_21\": " + (g.qos_always_21 ? "true" : "false") + ", \"last_violation\": \"" + v + "\"}";
    return out.c_str();
}

void orion_ane_standin_throw_next(const char* selector) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g.throw_in = selector ? selector : "";
}

void orion_ane_standin_fail_next_loads(int n) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g.fail_loads = n;
}

}  // extern "C"
