// SPDX-License-Identifier: Apache-2.0
// Which filesystems' files the gateway refuses as client segments (ClientSegment::Attach, not_mappable): by the
// type of the file's mount as /proc/self/mountinfo names it (read without asking the filesystem: fstatfs asks a
// FUSE server, and an NFS or CIFS server, which may not answer), injected here (no NFS mount on this VM). A FUSE
// file (session 23) and, since debt37, a file on a network filesystem (NFS, CIFS/SMB, 9p, Ceph, AFS, Lustre,
// GlusterFS...) are refused, the refusal naming the type and the path: a network file's pages come from its
// server (an access to the mapping waits on it, as on a FUSE server; a hard NFS mount waits for good), and its
// shared mappings are not kept coherent with other hosts' writes. Until debt37 those were mapped. Memory and
// local disk filesystems are taken. Also: a /dev/shm file (tmpfs) is attached through the whole check.
//
//   segment_fs_test
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "check.h"
#include "protocol/client_segment.h"

namespace {

using adp::testing::check;

void refused(const char* type, const char* kind) {
  const std::string path = std::string("/mnt/") + type + "/seg";
  const std::string why = adp::proto::segment_fs_refusal(type, path);
  check(!why.empty(), std::string(type) + ": a segment on it is mapped");
  if (why.empty()) return;
  check(why.find(kind) != std::string::npos, std::string(type) + ": the refusal says '" + kind + "': " + why);
  check(why.find(std::string(type) + " mount") != std::string::npos, std::string(type) + ": names the type: " + why);
  check(why.find(path) != std::string::npos, std::string(type) + ": names the path: " + why);
}

void taken(const char* type) {
  const std::string why = adp::proto::segment_fs_refusal(type, "/x/seg");
  check(why.empty(), std::string(type) + ": refused: " + why);
}

}  // namespace

int main() {
  for (const char* fuse : {"fuse", "fuseblk", "fuse.sshfs", "fuse.glusterfs"}) refused(fuse, "FUSE filesystem");
  for (const char* net : {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "afs", "lustre", "glusterfs", "ncpfs"})
    refused(net, "network filesystem");
  // The names the kernel's clients register, as mountinfo shows them (review37a): OrangeFS's module registers
  // "pvfs2" (fs/orangefs/orangefs-mod.c; `mount -t pvfs2`), not "orangefs"; BeeGFS's client "beegfs".
  for (const char* net : {"pvfs2", "beegfs"}) refused(net, "network filesystem");
  for (const char* local : {"tmpfs", "hugetlbfs", "ramfs", "ext4", "xfs", "btrfs", "overlay"}) taken(local);
  // A name that merely starts like a network one is not one ("nfsd" is the NFS server's control filesystem, no
  // file of which is a segment; "cephfs-like" stands for any unknown name): taken, as before.
  for (const char* other : {"nfsd", "cephfs-like"}) taken(other);

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
