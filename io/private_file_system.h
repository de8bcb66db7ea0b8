// SPDX-License-Identifier: Apache-2.0
// io/private_file_system.h: a RocksDB file system whose files are 0600 and directories 0700.
//
// RocksDB creates its files (SST, WAL, MANIFEST, CURRENT, IDENTITY, OPTIONS, LOG, LOCK) with
// mode 0644 less the umask, and its directories 0755 less the umask, and the installed RocksDB
// (7.8) has no option to choose the mode. Setting the process umask around a DB open would be
// process-wide and racy in a library, and would not cover files created later (flushes,
// compactions, new WALs, log rotation). PrivateFileSystem wraps RocksDB's FileSystem instead:
// before every call that may create a file it creates it itself with mode 0600 (O_CREAT, then
// fchmod so that a file left by an older ckv is tightened too), and before every directory
// creation it makes the directory 0700; then it forwards the call, which opens the existing
// file (RocksDB opens with O_CREAT | O_TRUNC, which keeps the mode). A file therefore never
// exists with a wider mode, not even for a moment.
//
// Thread-safety: thread-safe, as the wrapped file system.
#ifndef CKV_IO_PRIVATE_FILE_SYSTEM_H_
#define CKV_IO_PRIVATE_FILE_SYSTEM_H_

#include <memory>
#include <string>

#include "rocksdb/env.h"

namespace ckv::io {

class FileSystem;

// An Env for RocksDB's DBOptions::env whose file system is PrivateFileSystem over RocksDB's
// default, under `wrapper->CatalogFileSystem` when `wrapper` is not null (a fault-injecting
// file system puts the catalog behind its seam that way). The Env must outlive every DB opened
// with it; `wrapper` must outlive the Env.
std::unique_ptr<rocksdb::Env> NewPrivateEnv(FileSystem* wrapper = nullptr);

// Tightens what is already there: `dir` and every directory under it to 0700, every file to
// 0600 (a catalog written by a ckv that let RocksDB choose). Errors are returned; nothing is
// created.
rocksdb::Status TightenModes(const std::string& dir);

}  // namespace ckv::io

#endif  // CKV_IO_PRIVATE_FILE_SYSTEM_H_
