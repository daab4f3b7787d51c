// SPDX-License-Identifier: Apache-2.0
// Which filesystems' files the gateway refuses as client segments (ClientSegment::Attach, not_mappable): by the
// type of the file's mount as /proc/self/mountinfo names it (read without asking the filesystem: fstatfs asks a
// FUSE server, and an NFS or CIFS server, which may not answer), injected here (no NFS mount on this VM). A FUSE
// file (session 23) and, since debt37, a file on a network filesystem (NFS, CIFS/SMB, 9p, Ceph, AFS, Lustre,
// GlusterFS...) are refused, the refusal naming the type and the path: a network file's pages come from its
// server (an access to the mapping waits on it, as on a FUSE server; a hard NFS mount waits for good), and its
// shared mappings are not kept coherent with other hosts' writes. Until debt37 those were mapped; a hypervisor's
// shared folder (virtiofs, vboxsf, vmhgfs, prl_fs: the host's file server serves its pages) until debt38b. Memory
// and local disk filesystems are taken. The refusal fits the Error frame (256 bytes) whole, the verdict and the
// type first, a long path cut in the middle (debt38b). Also: a /dev/shm file (tmpfs) is attached through the whole
// check.
//
//   segment_fs_test
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "check.h"
#include "protocol/client_segment.h"
#include "protocol/frame.h"
#include "util/log.h"

namespace {

using adp::testing::check;

void refused(const char* type, const char* kind) {
  const std::string path = std::string("/mnt/") + type + "/seg";
  const std::string why = adp::proto::segment_fs_refusal(type, path);
  check(!why.empty(), std::string(type) + ": a segment on it is mapped");
  if (why.empty()) return;
  check(why.starts_with("segment not mapped: "), std::string(type) + ": the verdict first: " + why);
  check(why.find(kind) != std::string::npos, std::string(type) + ": the refusal says '" + kind + "': " + why);
  check(why.find(std::string(type) + " mount") != std::string::npos, std::string(type) + ": names the type: " + why);
  check(why.find(path) != std::string::npos, std::string(type) + ": names the path: " + why);
}

void taken(const char* type) {
  const std::string why = adp::proto::segment_fs_refusal(type, "/x/seg");
  check(why.empty(), std::string(type) + ": refused: " + why);
}

// debt38b: the refusal ran to 260 bytes and more with "not mapped" at its end, so the gateway's log line (cut at 200)
// never carried the verdict, and with a long path the Error frame (kMaxMessageBytes, 256) lost it too. Now it fits
// the frame whole whatever the path (the log line takes as much, ClientHandler::refuse): the verdict and the type
// whole, the path cut in the middle (its head and its tail kept), the advice at the end.
void fits(const char* type, const std::string& path, const std::string& head, const std::string& tail) {
  const std::string why = adp::proto::segment_fs_refusal(type, path);
  const std::string what = std::string(type) + ", a path of " + std::to_string(path.size()) + " bytes: ";
  check(!why.empty() && why.size() <= adp::proto::kMaxMessageBytes,
        what + std::to_string(why.size()) + " bytes, past the Error frame's " +
            std::to_string(adp::proto::kMaxMessageBytes) + ": " + why);
  check(why.starts_with("segment not mapped: "), what + "the verdict first: " + why);
  check(why.find(std::string(" (") + type + " mount: ") != std::string::npos, what + "the type whole: " + why);
  check(why.find(head) != std::string::npos && why.find(tail) != std::string::npos,
        what + "the path's head '" + head + "' and tail '" + tail + "': " + why);
  check(why.ends_with("register memory files (/dev/shm)"), what + "whole, to its end: " + why);
  // Printable ASCII only (the client's bytes escaped as log_safe escapes them): no byte that is not UTF-8 reaches the
  // connector's str, none that garbles the log.
  bool printable = true;
  for (const char c : why) printable = printable && c >= 0x20 && c < 0x7f;
  check(printable, what + "not printable ASCII: " + adp::log_safe(why, SIZE_MAX));
}

void long_paths() {
  std::string path = "/mnt/share/head-of-the-path";
  while (path.size() < 600) path += "/a-long-directory-name";
  path += "/tail-of-the-path.seg";
  for (const char* type : {"nfs4", "cifs", "fuse.sshfs", "fuseblk"}) fits(type, path, "/mnt/share/head", "path.seg");
  // Bytes outside printable ASCII become \xNN (4 bytes each): none cut part-way at either side of the cut.
  std::string odd = "/mnt/share/";
  for (int i = 0; i < 150; i++) odd += "\xc3\xa9";  // "é" x 150
  odd += "/end.seg";
  const std::string why = adp::proto::segment_fs_refusal("nfs4", odd);
  fits("nfs4", odd, "/mnt/share/\\xc3", "\\xa9/end.seg");
  const size_t cut = why.find("...");
  check(cut != std::string::npos, "an escaped path of " + std::to_string(odd.size()) + " bytes is cut: " + why);
  if (cut != std::string::npos) {
    const std::string before = why.substr(0, cut), after = why.substr(cut + 3);
    const size_t b = before.rfind('\\'), a = after.find('\\');
    check(b != std::string::npos && b + 4 == before.size(), "the cut ends after a whole escape: " + why);
    check(a == 0, "the cut's tail starts at an escape: " + why);
  }
  // A path that fits is given whole, no "...".
  check(adp::proto::segment_fs_refusal("nfs4", "/mnt/s/l1").find("/mnt/s/l1)") != std::string::npos,
        "a short path whole");
  // A FUSE subtype is its mounter's choice: one of 300 bytes is cut too (the verdict, the kind and the path kept).
  const std::string subtype = "fuse." + std::string(300, 'x');
  const std::string w = adp::proto::segment_fs_refusal(subtype, "/mnt/f/seg");
  check(w.size() <= adp::proto::kMaxMessageBytes && w.starts_with("segment not mapped: a FUSE file (fuse.x") &&
            w.find(" mount: /mnt/f/seg)") != std::string::npos,
        "a long FUSE subtype: " + w);
}

}  // namespace

int main() {
  for (const char* fuse : {"fuse", "fuseblk", "fuse.sshfs", "fuse.glusterfs"}) refused(fuse, "FUSE file");
  for (const char* net : {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "afs", "lustre", "glusterfs", "ncpfs"})
    refused(net, "network filesystem");
  // The names the kernel's clients register, as mountinfo shows them (review37a): OrangeFS's module registers
  // "pvfs2" (fs/orangefs/orangefs-mod.c; `mount -t pvfs2`), not "orangefs"; BeeGFS's client "beegfs".
  for (const char* net : {"pvfs2", "beegfs"}) refused(net, "network filesystem");
  // debt38b: a hypervisor's shared folder (virtiofs is FUSE, but mountinfo says "virtiofs"; vboxsf; VMware's vmhgfs;
  // Parallels' prl_fs): its pages come from the host's file server, as a FUSE file's from its server. Until then
  // mapped.
  for (const char* shared : {"virtiofs", "vboxsf", "vmhgfs", "prl_fs"}) refused(shared, "hypervisor-shared file");
  for (const char* shared : {"virtiofs", "vboxsf"})
    fits(shared, "/mnt/" + std::string(600, 'v') + "/seg", "/mnt/vvv", "vvv/seg");
  for (const char* local : {"tmpfs", "hugetlbfs", "ramfs", "ext4", "xfs", "btrfs", "overlay"}) taken(local);
  // A name that merely starts like a network one is not one ("nfsd" is the NFS server's control filesystem, no
  // file of which is a segment; "cephfs-like" stands for any unknown name): taken, as before.
  for (const char* other : {"nfsd", "cephfs-like"}) taken(other);
  long_paths();

  // A memory file through Attach: taken (the mount check reads /proc, asks no filesystem).
  char path[] = "/dev/shm/adp-segment-fs-test.XXXXXX";
  const int fd = ::mkstemp(path);
  check(fd >= 0, "a /dev/shm file");
  if (fd >= 0) {
    ::unlink(path);
    check(::ftruncate(fd, 1 << 20) == 0, "its size");
    std::unique_ptr<adp::proto::ClientSegment> seg;
    const adp::Status s = adp::proto::ClientSegment::Attach(fd, 1 << 20, &seg);  // takes fd over
    check(s.ok(), "a /dev/shm segment attached: " + s.message());
  }
  return adp::testing::finish("segment_fs_test");
}
