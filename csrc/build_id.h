// Which build of an extension is loaded. setup.py and CMakeLists.txt define SPECRT_BUILD_ID as
// a hash of the extension's sources, headers (and, in setup.py, compiler flags), and each module
// exposes it as build_id(): cost calibration keys its timings by it, so timings measured with
// one build of a kernel are never reused with another, without stat-ing the .so or importing
// private modules.
#pragma once

#ifndef SPECRT_BUILD_ID
#define SPECRT_BUILD_ID "unversioned"  // a build that bypassed setup.py and CMake
#endif
