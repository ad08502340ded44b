// Shared helpers of the C++ tests (UMap's C++ API): checks.
#ifndef UPAGER_TEST_COMMON_HPP
#define UPAGER_TEST_COMMON_HPP

#include <cstdio>
#include <cstdlib>

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            std::fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__,    \
                         __LINE__, #cond);                                 \
            std::fprintf(stderr, __VA_ARGS__);                             \
            std::fprintf(stderr, "\n");                                    \
            std::exit(1);                                                  \
        }                                                                  \
    } while (0)

#endif
