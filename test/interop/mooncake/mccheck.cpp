// mccheck: a byte check through Mooncake's own Transfer Engine (classic
// API, include/transfer_engine.h). run.sh builds it against a Mooncake
// build tree with the compile and link lines of Mooncake's
// transfer_engine_bench, so it runs the very library that the bench runs.
//
//   mccheck METADATA LOCAL_SERVER_NAME SEGMENT SIZE COUNT [PROTO [DEVICES]]
//
// PROTO rdma takes DEVICES, the RDMA devices (rxe0,rxe2), as the NIC
// priority matrix {"cpu:0": [[DEVICES], []]}, as transfer_engine_bench
// builds it from --device_name.
//
// Opens SEGMENT, then per round: fills COUNT blocks of SIZE bytes with a
// pattern that differs per round and per block, WRITEs them to the
// target's first buffer, zeroes the local copy, READs them back and
// compares. Three rounds, so stale memory on the target cannot pass.
// Prints one "mccheck: ok ..." line and exits 0, or says what differed
// and exits 1.
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "transfer_engine.h"

using namespace mooncake;

static uint8_t pattern(uint64_t round, uint64_t off) {
    uint64_t x = (off + 1) * 0x9E3779B97F4A7C15ull ^ (round + 1) * 0xBF58476D1CE4E5B9ull;
    return uint8_t(x >> 56);
}

// run submits one batch of count requests of size bytes and waits for all.
static bool run(TransferEngine &eng, SegmentID seg, uint64_t remote,
                uint8_t *local, size_t size, size_t count,
                TransferRequest::OpCode op) {
    BatchID b = eng.allocateBatchID(count);
    std::vector<TransferRequest> reqs(count);
    for (size_t i = 0; i < count; i++) {
        reqs[i].opcode = op;
        reqs[i].source = local + i * size;
        reqs[i].target_id = seg;
        reqs[i].target_offset = remote + i * size;
        reqs[i].length = size;
    }
    Status s = eng.submitTransfer(b, reqs);
    if (!s.ok()) {
        fprintf(stderr, "mccheck: submit: %s\n", s.ToString().c_str());
        return false;
    }
    bool ok = true;
    for (size_t i = 0; i < count; i++) {
        TransferStatus st;
        for (;;) {
            if (!eng.getTransferStatus(b, i, st).ok()) {
                st.s = TransferStatusEnum::FAILED;
            }
            if (st.s == TransferStatusEnum::COMPLETED) break;
            if (st.s == TransferStatusEnum::FAILED ||
                st.s == TransferStatusEnum::TIMEOUT ||
                st.s == TransferStatusEnum::CANCELED ||
                st.s == TransferStatusEnum::INVALID) {
                fprintf(stderr, "mccheck: %s request %zu failed (state %d)\n",
                        op == TransferRequest::WRITE ? "write" : "read", i,
                        int(st.s));
                ok = false;
                break;
            }
        }
    }
    eng.freeBatchID(b);
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr,
                "usage: mccheck METADATA LOCAL_SERVER_NAME SEGMENT SIZE COUNT "
                "[PROTO [DEVICES]]\n");
        return 2;
    }
    std::string meta = argv[1], lsn = argv[2], segname = argv[3];
    size_t size = strtoull(argv[4], nullptr, 0);
    size_t count = strtoull(argv[5], nullptr, 0);
    std::string proto = argc > 6 ? argv[6] : "tcp";
    if (size == 0 || count == 0) {
        fprintf(stderr, "mccheck: SIZE and COUNT must be positive\n");
        return 2;
    }
    size_t total = size * count;
    TransferEngine eng(false);
    std::string host = lsn.substr(0, lsn.rfind(':'));
    if (eng.init(meta, lsn, host, 12345) != 0) {
        fprintf(stderr, "mccheck: init %s failed\n", meta.c_str());
        return 1;
    }
    std::string matrix;
    void *targs[2] = {nullptr, nullptr};
    if (proto == "rdma") {
        std::string devs = argc > 7 ? argv[7] : "";
        if (devs.empty()) {
            fprintf(stderr, "mccheck: rdma needs DEVICES\n");
            return 2;
        }
        std::string list;
        size_t from = 0;
        while (from <= devs.size()) {
            size_t to = devs.find(',', from);
            if (to == std::string::npos) to = devs.size();
            if (!list.empty()) list += ",";
            list += "\"" + devs.substr(from, to - from) + "\"";
            from = to + 1;
        }
        matrix = "{\"cpu:0\": [[" + list + "], []]}";
        targs[0] = const_cast<char *>(matrix.c_str());
    }
    if (!eng.installTransport(proto, proto == "rdma" ? targs : nullptr)) {
        fprintf(stderr, "mccheck: install %s failed\n", proto.c_str());
        return 1;
    }
    void *mem = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mccheck: mmap");
        return 1;
    }
    uint8_t *buf = static_cast<uint8_t *>(mem);
    if (eng.registerLocalMemory(buf, total, "cpu:0") != 0) {
        fprintf(stderr, "mccheck: register failed\n");
        return 1;
    }
    SegmentID seg = eng.openSegment(segname);
    auto desc = eng.getMetadata()->getSegmentDescByID(seg);
    if (!desc || desc->buffers.empty()) {
        fprintf(stderr, "mccheck: no descriptor (or no buffer) for %s\n",
                segname.c_str());
        return 1;
    }
    uint64_t remote = desc->buffers[0].addr;
    if (desc->buffers[0].length < total) {
        fprintf(stderr, "mccheck: %s's buffer has %llu bytes, want %zu\n",
                segname.c_str(),
                (unsigned long long)desc->buffers[0].length, total);
        return 1;
    }
    for (uint64_t round = 0; round < 3; round++) {
        for (size_t i = 0; i < total; i++) buf[i] = pattern(round, i);
        if (!run(eng, seg, remote, buf, size, count, TransferRequest::WRITE))
            return 1;
        memset(buf, 0, total);
        if (!run(eng, seg, remote, buf, size, count, TransferRequest::READ))
            return 1;
        for (size_t i = 0; i < total; i++) {
            if (buf[i] != pattern(round, i)) {
                fprintf(stderr,
                        "mccheck: round %llu: byte %zu read back %#x, wrote "
                        "%#x\n",
                        (unsigned long long)round, i, buf[i],
                        pattern(round, i));
                return 1;
            }
        }
    }
    printf("mccheck: ok %s: %zu x %zu bytes written, read back and compared, "
           "3 rounds, over %s\n",
           segname.c_str(), count, size, proto.c_str());
    eng.unregisterLocalMemory(buf);
    return 0;
}
