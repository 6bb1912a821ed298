/* idem/version.h - the version of the idem headers.
 *
 * IDEM_VERSION_* describe the headers a program was compiled against;
 * idem_version() (in idem.h) reports the library it runs against. The two
 * differ when a program built against one release loads a newer shared
 * library; a program that needs a feature can compare both. */
#ifndef IDEM_VERSION_H
#define IDEM_VERSION_H

#define IDEM_VERSION_MAJOR 0
#define IDEM_VERSION_MINOR 1
#define IDEM_VERSION_PATCH 0
#define IDEM_VERSION_STRING "0.1.0"

/* One number that grows with each release: 0x00MMmmpp. */
#define IDEM_VERSION_NUMBER                                                \
    ((IDEM_VERSION_MAJOR << 16) | (IDEM_VERSION_MINOR << 8) |              \
     IDEM_VERSION_PATCH)

#endif
